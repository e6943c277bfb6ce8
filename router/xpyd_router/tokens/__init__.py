"""The engine's tokenizer in the router, so prompt blocks are cut into the engine's own tokens.

`engine` picks the tokenizer (`make_tokenizer`); `hub_files` fetches its files from the Hugging Face
Hub; `chat_template` renders a chat request's prompt as the engine does; `cache` tokenizes a chat
segment by segment and keeps each segment's ids.
"""
