# SPDX-License-Identifier: Apache-2.0
# The runtime's log lines into logging.getLogger("kvblocks") (include/kvblocks/log.h, log_queue.h).
# Runtime threads push into a bounded C++ queue and return at once (they never take the GIL); a
# daemon thread waits on the queue with the GIL released, then drains it holding the GIL, and the
# calls that log on the caller's thread (initialize, set_role, link_llm_clusters) drain it before
# returning, so their records come first, in order. Records leave the queue only under the GIL: the
# exit drain (atexit) logs whatever no thread logged yet.
import atexit as _atexit
import logging as _logging
import os as _os
import sys as _sys
import threading as _threading

_logger = _logging.getLogger("kvblocks")
cdef LogQueue* _log_queue = new LogQueue()  # never freed: runtime threads may log during exit
_log_thread = None


cdef inline void _log_record(int level, c_string& msg):
    text = msg.decode("utf-8", "replace")
    if not _logger.hasHandlers():
        # Nobody configured logging: stderr, as the runtime writes it (and at info level too, which
        # Python's last-resort handler would drop although KVBLOCKS_LOG_LEVEL=2 asked for it).
        _sys.stderr.write(f"[kvblocks {'WARN' if level <= 1 else 'INFO'} pid={_os.getpid()}] {text}\n")
        return
    _logger.log(_logging.WARNING if level <= 1 else _logging.INFO, "%s", text)


cdef int _drain_logs() except -1:
    """Logs every record waiting now, without blocking."""
    cdef int level = 0
    cdef c_string msg
    while _log_queue.Pop(&level, &msg):
        _log_record(level, msg)
    return 0


def _log_pump():
    cdef c_bool got
    while True:
        with nogil:
            got = _log_queue.Wait(1000)
        if got:
            try:
                _drain_logs()
            except Exception:  # a broken handler must not stop the pump
                pass


def _start_log_pump():
    global _log_thread
    _log_thread = _threading.Thread(target=_log_pump, name="kvblocks-log", daemon=True)
    _log_thread.start()


def _stop_log_routing():
    """At exit: back to stderr (records still queued are logged first), so lines from engines that
    finalize during interpreter shutdown are not lost in a queue nobody reads."""
    SetLogCallback(NULL, NULL)
    _drain_logs()


def _after_fork_in_child():
    _log_queue.ResetAfterFork()
    _start_log_pump()


def route_logs_to_python(bint enable=True):
    """Sends the runtime's log lines to ``logging.getLogger("kvblocks")`` (``enable``, the default
    on import) or back to stderr. ``KVBLOCKS_LOG_LEVEL`` still decides which lines the runtime
    produces (0 none, 1 warnings (default), 2 also info)."""
    if enable:
        SetLogCallback(LogQueue.Push, <void*>_log_queue)
    else:
        SetLogCallback(NULL, NULL)
        _drain_logs()


route_logs_to_python(True)
_start_log_pump()
_atexit.register(_stop_log_routing)
_os.register_at_fork(after_in_child=_after_fork_in_child)
