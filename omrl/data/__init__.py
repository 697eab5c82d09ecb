"""omrl's data model: the Batch container and the trajectory (Episode) records."""

from omrl.data.batch import Batch
from omrl.data.trajectory import Episode, Turn, read_episodes, write_episodes

__all__ = ["Batch", "Episode", "Turn", "read_episodes", "write_episodes"]
