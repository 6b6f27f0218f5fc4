"""One room per public API (`openai/`, `responses/`, `anthropic/`, `friendli/`, `monster/`, `tgi/`,
`datacrunch/`, `sglang/`), each with its request structs, validation, rendering and routes; `shared_paths`
dispatches the paths TGI and SGLang share; `bounds` and `openapi` are what every room builds on (the
`Dialect` base is `gateway.serving.dialect`); `fast_path` answers the generation routes ahead of Litestar's
router. `gateway.edge.app` mounts the rooms."""
