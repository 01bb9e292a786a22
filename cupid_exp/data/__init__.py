"""The CUPID data: the instance schema and its row validator, and loading from the Hub, files or the sample."""
