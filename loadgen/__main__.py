from loadgen.cli import main

main()
