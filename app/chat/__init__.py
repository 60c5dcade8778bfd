"""The chat: conversation storage, message rendering, and the chat page."""
