"""The models' tokenizers: loading them off the event loop, and counting a prompt's tokens
for the rules that need it."""
