"""The JSON-schema task of the structured-output benchmarks (bench_turns.py's json scenario,
bench_constraints.py, bench_constraints_greedy.py): a list of exactly 5 objects of 4 fields,
the question asking for it, and the greedy answer Qwen2.5-Coder 1.5B gives (123 tokens).
No imports: the constraint-engine benchmark runs in a venv of its own."""

SCHEMA = {"type": "object", "properties": {"languages": {
    "type": "array", "minItems": 5, "maxItems": 5, "items": {
        "type": "object", "properties": {
            "name": {"type": "string"}, "paradigm": {"type": "string"},
            "year": {"type": "integer"}, "typed": {"type": "boolean"}},
        "required": ["name", "paradigm", "year", "typed"]}}}, "required": ["languages"]}
JSON_ASK = "List 5 programming languages with their main paradigm, first year and whether " \
           "they are statically typed, as JSON."
ANSWER = ('{"languages":[{"name":"Python","paradigm":"Object-Oriented","year":2000,'
          '"typed":false},{"name":"Java","paradigm":"Object-Oriented","year":1995,"typed":true},'
          '{"name":"JavaScript","paradigm":"Prototype-Based","year":1995,"typed":false},'
          '{"name":"C++","paradigm":"Object-Oriented","year":1980,"typed":true},'
          '{"name":"Ruby","paradigm":"Object-Oriented","year":1995,"typed":false}]}')
