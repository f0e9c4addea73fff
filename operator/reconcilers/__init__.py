"""One reconciler per kind: typed spec and status in, an Outcome out. They
read the actual state of the world through the ports on every call, so the
same function serves create, update, resume and the periodic resync."""
