from pdlaunch.cli import main

main()
