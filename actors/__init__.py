"""The run's roles as Ray actors. A role's process sends its output to its log file from the first import
of this package (core.role_log), before any library prints."""
from core.role_log import capture_output as _capture_output

_capture_output()
