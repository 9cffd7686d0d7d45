from bot.cli.app import main

main()
