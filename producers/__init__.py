"""What publishes raw telemetry: the fault-injecting simulator, replay of a recorded run, the PyTorch
tracer, the node agent and its counters, the importers.
"""
