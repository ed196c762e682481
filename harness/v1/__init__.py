"""Generated from proto/harness/v1 by `make proto`; do not edit."""
