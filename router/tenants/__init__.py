"""Tenants: who a request is from, and the limits each may use, counted once for the whole
deployment (docs/tenants.md)."""
