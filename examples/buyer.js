// A buyer's whole purchase against a seckill API, with Node 20's fetch and nothing else: the
// item, a ticket, the purchase (with an Idempotency-Key, retried with the same key when told to
// come back), then the order.
//
//     SECKILL_TOKEN=... node examples/buyer.js --url http://127.0.0.1:8000 ITEM_ID
//
// Prints the order as the API answers it, as one JSON line, and exits 0 when it is held (pay
// before pay_before) or paid, 1 otherwise.

"use strict";

const ATTEMPTS = 5; // a purchase told to come back (429, 503, 409 request_in_flight) is asked again

function parseArgs(argv) {
  const args = { url: process.env.SECKILL_URL || "http://127.0.0.1:8000", token: process.env.SECKILL_TOKEN };
  const rest = [];
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--url") args.url = argv[++i];
    else if (argv[i] === "--token") args.token = argv[++i];
    else rest.push(argv[i]);
  }
  if (rest.length !== 1 || !/^[0-9]+$/.test(rest[0]) || !args.token) {
    console.error("usage: node buyer.js [--url URL] [--token TOKEN | SECKILL_TOKEN=...] ITEM_ID");
    process.exit(2);
  }
  args.itemId = rest[0];
  return args;
}

async function buy({ url, token, itemId }) {
  const auth = { Authorization: `Bearer ${token}` };
  const call = (method, path, headers = {}, body) =>
    fetch(url + path, {
      method,
      headers: body === undefined ? { ...auth, ...headers } : { ...auth, ...headers, "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });

  const item = await call("GET", `/api/v1/items/${itemId}`);
  if (!item.ok) return item.json();
  const card = await item.json();
  // The shop charges price_cents (minor units: cents of EUR, yen of JPY) times the quantity, in
  // the item's currency: the sum seckill's payment notice must carry.
  const price = `${card.price_cents} ${card.currency} (minor units)`;
  console.error(`item ${itemId}: ${card.name}, ${price} each, ${card.available} left`);

  const ticket = await call("POST", `/api/v1/items/${itemId}/tickets`);
  if (ticket.status !== 200) return ticket.json(); // not_started, ended, sold_out, gate_refused
  const { ticket: pass } = await ticket.json();

  // One key per purchase the buyer means: a retry with it can never buy twice.
  const key = crypto.randomUUID();
  let bought;
  for (let attempt = 0; attempt < ATTEMPTS; attempt++) {
    bought = await call(
      "POST", `/api/v1/items/${itemId}/orders`,
      { "Idempotency-Key": key, "Seckill-Ticket": pass },
      { quantity: 1 },
    );
    const retryAfter = bought.headers.get("Retry-After");
    if ([409, 429, 503].includes(bought.status) && retryAfter !== null) {
      await new Promise((resolve) => setTimeout(resolve, Number(retryAfter) * 1000));
      continue;
    }
    break;
  }
  if (bought.status !== 202) return bought.json(); // sold_out, limit_reached, ...

  // Order ids are 64-bit decimal strings: never parse them as numbers.
  const { order_id: orderId } = await bought.json();
  const order = await call("GET", `/api/v1/items/${itemId}/orders/${orderId}`);
  return order.json();
}

buy(parseArgs(process.argv.slice(2))).then(
  (result) => {
    console.log(JSON.stringify(result));
    process.exit(["held", "paid"].includes(result.status) ? 0 : 1);
  },
  (error) => {
    console.error(error);
    process.exit(1);
  },
);
