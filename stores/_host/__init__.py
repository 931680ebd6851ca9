"""What the stores on one host (memory, file, SQLite) share about owners and leases:
OS locks that prove an owner alive (``oslock``), the lease records and who may take a
lease (``owners``), how a stored lease record is read (``lease_records``) and who holds
a run, read without writing (``holders``)."""

__all__: list[str] = []
