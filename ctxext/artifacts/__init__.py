"""What ctxext writes and reads back (core): the run record (``run.json``), the evaluation report schema, tables."""
