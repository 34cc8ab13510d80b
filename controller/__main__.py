from tillerman.controller.cli import main

main()
