from raylight.cli.main import main

main()
