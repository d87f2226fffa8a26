terraform {
  # 1.11: write-only attributes (the path token never enters a plan); 1.9: variable validations
  # that refer to other variables.
  required_version = ">= 1.11"

  # Only the AWS provider: the module can be planned and applied before the cluster exists (and
  # offline against a local AWS emulator, as the tests do). The registration lives in
  # modules/registration, composed by the examples.
  required_providers {
    aws = {
      source = "hashicorp/aws"
      # The version the tests apply (ephemeral aws_secretsmanager_random_password and the
      # write-only secret_string_wo need a recent 5.x). 6.x changes resource schemas and is
      # untested here, so it is not allowed until it is.
      version = "~> 5.100"
    }
  }
}
