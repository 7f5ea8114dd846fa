"""From token ids to text: incremental detokenization, stop ids and strings, and the
pipeline that runs them ahead of the model family's output parser."""
