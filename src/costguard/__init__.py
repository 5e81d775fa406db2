"""costguard: keep ML and science work on cloud GPUs within budget.

Four habits, each a command: ``costguard estimate`` before you run, ``costguard alarm``
on day one, checkpoint-and-resume on spot, and ``costguard reap`` for idle GPUs.

Importing this package loads no cloud SDK and no torch; each feature imports what it
needs when it is used.
"""

from costguard.secrets import install_log_redaction

__version__ = "0.1.0"

# Whatever handler prints a costguard log line, a credential in it is masked.
install_log_redaction()

__all__ = ["__version__"]
