"""`python -m pdlaunch`, the same as `pdlaunch`."""

from pdlaunch.cli import main

if __name__ == "__main__":
    main()
