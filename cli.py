"""`python cli.py fit --config configs/storm.yaml` (see README.md)."""
from lit_iclr.cli import main

if __name__ == "__main__":
    main()
