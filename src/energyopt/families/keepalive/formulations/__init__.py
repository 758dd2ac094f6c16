"""Keep-alive of serverless functions (``kind: keepalive``): warm, tepid or cold in
every window, on a node, within memory and power budgets (docs/formulations/keepalive.md)."""
