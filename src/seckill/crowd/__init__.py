"""A crowd of simulated buyers sent at a live API over HTTP, and the verdict on what it left.

``seckill demo`` sends one at a server it starts on embedded defaults; ``seckill bench --url``
sends the same crowd at any running deployment. Both audit the sale afterwards (``audit``) and
write a JSON result and an HTML report (``report``).
"""
