"""The serving layer: one generation request from parse to settlement (the pipeline), admission, accounting, tokenize,
and the worker client that every call to a worker goes through."""
