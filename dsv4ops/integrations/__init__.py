"""Engine integrations: glue that lets an inference engine run its DeepSeek-V4 layers on dsv4ops.

Each integration is a subpackage that imports its engine lazily (``import dsv4ops`` never imports
an engine); ``vllm`` is vLLM's general plugin (docs/integration.md, "vLLM").
"""
