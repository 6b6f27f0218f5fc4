"""One room per public API (`openai/`, `friendli/`, `monster/`, `tgi/`, `datacrunch/`, `sglang/`), each with
its request structs, validation, rendering and routes; `shared_paths` dispatches the paths TGI and SGLang
share; `base` and `openapi` are what every room builds on. `gateway.edge.app` mounts the rooms."""
