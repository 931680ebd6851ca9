"""What the stores on SQL tables (SQLite, PostgreSQL) share above their SQL: the rows
they read and write (``rows``), the columns beside a run's head checked against it
(``columns``), and a commit waiting for its batch, a head checked and replayed
(``tables``). Neither store imports the other."""

__all__: list[str] = []
