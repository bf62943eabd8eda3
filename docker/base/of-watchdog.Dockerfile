# Stand-in for ghcr.io/openfaas/of-watchdog:<version> (the python3-http template copies
# /fwatchdog out of it), made by scripts/base-images.sh when no registry serves it: the
# of-watchdog binary built from upstream (FEDFAAS_OPENFAAS_BIN), alone, as upstream ships it.
# Context: a folder holding only that binary, named of-watchdog.
FROM scratch
COPY of-watchdog /fwatchdog
ENTRYPOINT ["/fwatchdog"]
