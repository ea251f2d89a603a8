"""Where build steps run: the protocol (``protocol``), the local runner, the Docker
runner, and the memory limit both give a step."""
