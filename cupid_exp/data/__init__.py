"""The CUPID data: the instance schema and its row validator, and loading from the Hub, files or the sample."""

from cupid_exp.data.loading import LoadedData, load_instances
from cupid_exp.data.schema import INSTANCE_TYPES, DataError, Instance, Message, PriorSession, relevant_positions

__all__ = ["DataError", "INSTANCE_TYPES", "Instance", "LoadedData", "Message", "PriorSession", "load_instances",
           "relevant_positions"]
