"""The client-facing OpenAI API: request validation and response rendering."""
