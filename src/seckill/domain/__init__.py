"""Plain values and rules of a flash sale: no I/O here."""
