"""The worker process: the faust app, what it holds, its lifecycle, its bounded stop and its view of the broker."""
