"""The process: uvicorn serving the app with a graceful shutdown, the supervisor of several
worker processes, and the lifeline that takes children down with their parent."""
