"""Core: the recipe schema (one typed YAML file per run), its overrides, and settings → CLI flag generation."""
