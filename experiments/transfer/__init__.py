"""The default recipe on every base, read against issue 37's relative target (``run``, then ``read``)."""
