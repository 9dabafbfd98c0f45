"""This broker's release, the one place it is written.

Formats on disk and the cluster's handshake name releases: a refusal says which release
reads a file, and `RELEASES` lists the earlier ones the upgrade tests build from git.
"""

from typing import Final

RELEASE: Final = "0.2.0"
