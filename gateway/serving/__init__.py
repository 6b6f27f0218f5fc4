"""The serving layer: one generation request from parse to settlement (the pipeline), admission, accounting, tokenize."""
