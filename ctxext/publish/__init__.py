"""Workflow: merge an adapter run, write its model card, push it to the Hub."""
