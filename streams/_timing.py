"""TEMPORARY stage timing (not to be committed)."""
import logging, threading, time
import numpy as np
_log = logging.getLogger("hirflow.timing")
_d: dict[str, list] = {}
_lock = threading.Lock()
_last = [time.monotonic()]

def add(stage, values):
    with _lock:
        _d.setdefault(stage, []).extend(values)
        if time.monotonic() - _last[0] > 3:
            _last[0] = time.monotonic()
            parts = []
            for k, v in _d.items():
                if v:
                    a = np.asarray(v, float)
                    parts.append(f"{k}: n={len(a)} p50={np.percentile(a,50):.0f} p99={np.percentile(a,99):.0f}")
            _d.clear()
            _log.warning("TIMING " + " | ".join(parts))
