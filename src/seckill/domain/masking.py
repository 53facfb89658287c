"""The one rule for showing a URL that may carry a credential: in `seckill config check`, in a
refusal at start, in a log line. Whatever a URL's scheme, a credential hides in three places: a
password after the user name (``user:pass@``), a user name that is itself the credential (NATS's
``nats://TOKEN@host``), and a query option (Redis's ``?password=``). Each is shown as ``***``."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

MASK = "***"

# Query options that hold a credential (their names, lower case, contain one of these words).
_SECRET_OPTION = re.compile(r"pass|pwd|token|secret|auth|key|credential", re.IGNORECASE)


def mask_url(url: str) -> str:
    """``url`` with every credential in it replaced by ``***``; the scheme, host, port, path and
    the other query options as given. A value that does not parse as a URL is hidden whole
    after its scheme."""
    try:
        parts = urlsplit(url)
    except ValueError:
        scheme, found, _ = url.partition("://")
        return f"{scheme}://{MASK}" if found else MASK
    masked = url
    userinfo, at, address = parts.netloc.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        # A user name alone may be the credential itself (nats://TOKEN@host): hidden too.
        shown = f"{user}:{MASK}@{address}" if colon else f"{MASK}@{address}"
        masked = masked.replace(f"//{parts.netloc}", f"//{shown}", 1)
    if parts.query:
        query = "&".join(_masked_option(option) for option in parts.query.split("&"))
        masked = masked.replace(f"?{parts.query}", f"?{query}", 1)
    return masked


def mask_in(text: str, *urls: str) -> str:
    """``text`` (a driver's error, say) with each of ``urls`` in it shown masked, and the
    credentials they hold hidden wherever else they appear."""
    for url in urls:
        if not url:
            continue
        text = text.replace(url, mask_url(url))
        for secret in _credentials(url):
            text = text.replace(secret, MASK)
    return text


def _masked_option(option: str) -> str:
    name, equals, value = option.partition("=")
    if equals and value and _SECRET_OPTION.search(name):
        return f"{name}={MASK}"
    return option


def _credentials(url: str) -> list[str]:
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    # A lone user name is not searched for: most are names (postgres), and the URL itself,
    # replaced first, already hides a token given that way.
    found = [parts.password or ""]
    for option in parts.query.split("&"):
        name, _, value = option.partition("=")
        if _SECRET_OPTION.search(name):
            found.append(value)
    # Short values (a user name like "u") would mask innocent text: only real secrets.
    return [secret for secret in found if len(secret) >= 4]
