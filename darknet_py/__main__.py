"""`python -m darknet_py`: the darknet-py command line."""

from .cli import main

if __name__ == "__main__":
    main()
