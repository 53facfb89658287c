"""Redis against SQL: do the two records of an item agree?

Exact once the item's stream is drained (every event landed). Comparing a sale in flight, by
stream position, comes with the reconciler.
"""

from __future__ import annotations

from seckill.domain.items import Stock
from seckill.engine.audit import Check, journal_check
from seckill.engine.engine import RedisEngine
from seckill.store.ledger import Ledger


async def compare_records(engine: RedisEngine, ledger: Ledger, item_id: int) -> list[Check]:
    holds = await engine.holds(item_id)
    orders = await ledger.orders(item_id)
    in_redis = {o: (h.buyer, h.quantity, h.order_status) for o, h in holds.items()}
    in_sql = {o: (r.buyer, r.quantity, r.status) for o, r in orders.items()}
    missing = in_redis.keys() - in_sql.keys()
    unknown = in_sql.keys() - in_redis.keys()
    differ = [o for o in in_redis.keys() & in_sql.keys() if in_redis[o] != in_sql[o]]
    redis_stock = await engine.stock(item_id)
    sql_stock = await ledger.stock(item_id)
    return [
        Check(
            "every order in SQL",
            not missing and not unknown and not differ,
            f"{len(in_sql)} orders for {len(in_redis)} holds; {len(missing)} missing, "
            f"{len(unknown)} unknown to Redis, {len(differ)} differing",
        ),
        Check(
            "SQL stock == Redis stock", sql_stock == redis_stock, _stocks(sql_stock, redis_stock)
        ),
        journal_check("SQL", await ledger.journal_kinds(item_id), holds.values()),
    ]


def _stocks(sql: Stock | None, redis: Stock | None) -> str:
    def show(stock: Stock | None) -> str:
        if stock is None:
            return "no such item"
        return f"available {stock.available}, held {stock.held}, sold {stock.sold} of {stock.total}"

    return f"both {show(sql)}" if sql == redis else f"SQL {show(sql)}; Redis {show(redis)}"
