"""Choosing among equivalent upstream servers."""
