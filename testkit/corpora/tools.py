"""Function tools and prompts for the tool-calling tests and benches: three tools with their parameter schemas,
prompts that call them (or not), the `tool_choice` values, a Hermes-style tools template and a conversation that
called two tools and got their results back."""

from __future__ import annotations

from common.protocol import FunctionTool

WEATHER = FunctionTool(name="get_weather", description="Current weather in a city", parameters={
    "type": "object", "required": ["city"],
    "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["celsius", "fahrenheit"]}}})
TIME = FunctionTool(name="get_time", description="Local time in a time zone", parameters={
    "type": "object", "required": ["timezone"], "properties": {"timezone": {"type": "string", "maxLength": 32}}})
FLIGHTS = FunctionTool(name="search_flights", description="Find flights between two airports", parameters={
    "type": "object", "required": ["origin", "destination"],
    "properties": {"origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
                   "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
                   "passengers": {"type": "integer", "minimum": 1, "maximum": 9}}})
TOOLS = [WEATHER, TIME, FLIGHTS]
SCHEMAS = {tool.name: tool.parameters for tool in TOOLS}

PROMPTS = [
    "What's the weather like in Paris?", "What time is it in Tokyo right now?",
    "Find me a flight from JFK to LAX for two people.", "Is it raining in London today?",
    "I need the local time in New York.", "Book flights from CDG to FCO.",
    "How hot is it in Cairo in fahrenheit?", "Tell me a joke about cats.",
    "What is the capital of Italy?", "Do I need an umbrella in Seattle?",
    "When is it noon in Sydney?", "Search flights SFO to SEA for 3 passengers.",
    "Write a haiku about autumn.", "What's the temperature in Berlin in celsius?",
    "Which time zone is Madrid in and what time is it there?", "Get me from Boston (BOS) to Miami (MIA).",
    "Explain photosynthesis in one sentence.", "Weather report for Mumbai, please.",
    "What's the current time in UTC?", "Flights from ORD to DEN next week for one adult.",
]
CHOICES = ("required", "function", "auto", "none")

# A tools-aware template in the Hermes style (written for these tests; Qwen2.5 and others look like it).
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "Call one with <tool_call>\n{\"name\": ..., \"arguments\": ...}\n</tool_call><|im_end|>\n{%- endif %}"
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n"
    "{%- if message.content %}{{ message.content }}{% endif %}"
    "{%- for call in message.tool_calls or [] %}<tool_call>\n"
    "{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}\n</tool_call>{% endfor %}"
    "<|im_end|>\n{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)

# A conversation that called two tools and got their results back.
HISTORY = [
    {"role": "user", "content": "Weather in Paris and the time in Tokyo?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": {"timezone": "JST"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, cloudy"},
    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "21:04"}]},
]
