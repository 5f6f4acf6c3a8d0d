from eroica.cli.main import main

main()
