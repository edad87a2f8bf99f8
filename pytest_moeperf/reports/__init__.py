"""Reports as lines or documents (terminal, Markdown, JSON, JUnit); nothing here prints."""
