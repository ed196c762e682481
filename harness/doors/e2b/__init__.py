"""callbox as a drop-in for the E2B SDK: the control-plane REST API and envd over Connect."""
