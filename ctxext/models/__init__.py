"""Core: finding a model (folder, Hub id, ``builtin:``), loading it, devices, weight files, the grown models."""
