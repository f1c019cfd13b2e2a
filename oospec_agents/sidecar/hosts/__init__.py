"""Transport only: each host carries requests to a `runtime.WaveHost` and posts outcomes into a
`protocol.Ticket` -- in a thread of this process (thread.py), a worker process (process.py) or a Ray
actor (ray.py). `sidecar/load.py` is the one module that imports them."""
