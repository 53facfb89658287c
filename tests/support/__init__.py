"""What the tests share and no test is: helpers, fixtures they import by name, and the small
programs some tests run in a process of their own (to kill it)."""
