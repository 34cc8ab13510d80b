from tillerman.controller.cli.main import main

if __name__ == "__main__":  # not when a worker process imports this module as its main
    main()
