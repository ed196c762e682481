"""Generated from proto/harness/doors/e2b/envd by `make proto`; do not edit."""
