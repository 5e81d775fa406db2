"""Plain helpers and fixture plugins shared by several test folders (imported, never conftest)."""
