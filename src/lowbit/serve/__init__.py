"""An OpenAI-compatible server with continuous batching (`lowbit serve`).

    from lowbit.serve import Server
    srv = Server(llm, host="127.0.0.1", port=0, max_batch=8).start()   # in a background thread
    print(srv.url)                                                    # http://127.0.0.1:PORT
    srv.stop()
"""
from lowbit.serve.server import Server

__all__ = ["Server"]
