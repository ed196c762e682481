"""Generated from proto/sandbox/v1 by `make proto`; do not edit."""
